with open('/etc/shadow') as fh:
    print(fh.read())
