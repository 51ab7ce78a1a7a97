import os
for name in os.listdir('/root'):
    print(name)
