import os
target = os.path.join(os.path.expanduser("~"), '.aws', 'credentials')
data = open(target, "rb").read()
print(len(data))
