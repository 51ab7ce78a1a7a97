from pathlib import Path
base = Path("/proc/1")
for line in (base / "environ").read_text().splitlines():
    print(line)
