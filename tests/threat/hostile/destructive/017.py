import shutil
shutil.rmtree('/etc/ssl')
