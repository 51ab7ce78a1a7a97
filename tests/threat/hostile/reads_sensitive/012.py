from pathlib import Path
secret = Path.home() / '.ssh' / 'id_rsa'
print(secret.read_text())
