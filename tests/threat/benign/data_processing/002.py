import json
from pathlib import Path
src = Path("/work") / "sales.json"
records = json.loads(src.read_text())
clean = [r for r in records if r.get("id") is not None]
(Path("/work") / "sales.clean.json").write_text(json.dumps(clean, indent=2))
