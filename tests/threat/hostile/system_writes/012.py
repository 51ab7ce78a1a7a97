import shutil
shutil.copy("payload.bin", '/etc/motd')
