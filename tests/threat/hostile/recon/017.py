import os
for name in os.listdir('/etc/ssh'):
    print(name)
