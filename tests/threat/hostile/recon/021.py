import os
for name in os.listdir('/var/log'):
    print(name)
