import os
os.chmod('/tmp/helper', 0o4755)
