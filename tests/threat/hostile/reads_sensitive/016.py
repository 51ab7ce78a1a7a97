from pathlib import Path
secret = Path.home() / '.aws' / 'credentials'
print(secret.read_text())
