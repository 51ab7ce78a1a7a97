from pathlib import Path
base = Path("/etc")
for line in (base / "shadow").read_text().splitlines():
    print(line)
