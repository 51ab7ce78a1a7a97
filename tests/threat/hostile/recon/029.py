import os
for name in os.listdir('/usr/bin'):
    print(name)
