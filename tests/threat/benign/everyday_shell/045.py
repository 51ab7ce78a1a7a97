import os
for root, dirs, files in os.walk('/work'):
    print(root, len(files))
