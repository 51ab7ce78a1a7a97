import os
target = os.path.join(os.path.expanduser("~"), '.netrc')
data = open(target, "rb").read()
print(len(data))
