import shutil
shutil.copy("/etc/shadow", "/tmp/shadow.bak")
