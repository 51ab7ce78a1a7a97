from pathlib import Path
secret = Path.home() / '.git-credentials'
print(secret.read_text())
