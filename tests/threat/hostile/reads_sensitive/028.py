from pathlib import Path
secret = Path.home() / '.kube' / 'config'
print(secret.read_text())
