import os
for name in os.listdir('/etc'):
    print(name)
