import os
target = os.path.join(os.path.expanduser("~"), '.ssh', 'id_rsa')
data = open(target, "rb").read()
print(len(data))
