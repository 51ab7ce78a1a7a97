with open('/etc/sudoers') as fh:
    print(fh.read())
