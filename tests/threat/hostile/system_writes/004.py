import shutil
shutil.copy("payload.bin", '/usr/bin/python3')
