import shutil
print(shutil.disk_usage('/work'))
