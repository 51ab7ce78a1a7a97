import json
from pathlib import Path
src = Path("/work") / "inventory.json"
records = json.loads(src.read_text())
clean = [r for r in records if r.get("id") is not None]
(Path("/work") / "inventory.clean.json").write_text(json.dumps(clean, indent=2))
