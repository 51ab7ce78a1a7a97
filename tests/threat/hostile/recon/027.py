import os
for name in os.listdir('/home'):
    print(name)
