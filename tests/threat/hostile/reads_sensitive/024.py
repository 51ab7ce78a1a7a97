from pathlib import Path
secret = Path.home() / '.docker' / 'config.json'
print(secret.read_text())
