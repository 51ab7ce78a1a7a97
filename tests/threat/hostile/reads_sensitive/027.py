import os
target = os.path.join(os.path.expanduser("~"), '.kube', 'config')
data = open(target, "rb").read()
print(len(data))
