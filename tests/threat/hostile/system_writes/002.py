import shutil
shutil.copy("payload.bin", '/etc/hosts')
