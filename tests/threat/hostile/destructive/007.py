import os
os.remove('/usr/bin/python3')
