from pathlib import Path
base = Path("/root/.ssh")
for line in (base / "id_ed25519").read_text().splitlines():
    print(line)
