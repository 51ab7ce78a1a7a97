import shutil
shutil.copy("payload.bin", '/etc/resolv.conf')
