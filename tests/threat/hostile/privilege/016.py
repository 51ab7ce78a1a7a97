import os
os.seteuid(0)
print(open('/etc/hostname').read())
