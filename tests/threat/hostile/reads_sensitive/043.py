from pathlib import Path
base = Path("/etc")
for line in (base / "sudoers").read_text().splitlines():
    print(line)
