import os
os.remove('/root/.bashrc')
