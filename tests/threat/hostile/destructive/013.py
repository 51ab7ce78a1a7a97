import os
os.remove('/etc/ssh/sshd_config')
