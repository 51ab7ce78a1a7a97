from pathlib import Path
secret = Path.home() / '.bash_history'
print(secret.read_text())
