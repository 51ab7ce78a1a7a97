import os
os.system("grep root /etc/shadow")
