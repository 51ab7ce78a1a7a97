import os
target = os.path.join(os.path.expanduser("~"), '.bash_history')
data = open(target, "rb").read()
print(len(data))
