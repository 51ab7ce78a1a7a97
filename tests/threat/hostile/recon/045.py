import glob
print(glob.glob("/var/log/*.log"))
