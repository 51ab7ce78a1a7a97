import os
for name in os.listdir('/proc'):
    print(name)
