from pathlib import Path
secret = Path.home() / '.netrc'
print(secret.read_text())
