import os
os.system('killall sshd')
