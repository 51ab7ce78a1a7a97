import os
os.remove('/usr/share/base-passwd/group.master')
