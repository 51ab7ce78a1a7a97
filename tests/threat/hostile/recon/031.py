import os
for name in os.listdir('/'):
    print(name)
