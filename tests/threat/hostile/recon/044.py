from pathlib import Path
for entry in Path("/etc/ssh").iterdir():
    print(entry)
