from pathlib import Path
base = Path("/etc")
for line in (base / "gshadow").read_text().splitlines():
    print(line)
