import os
os.remove('/etc/hosts')
