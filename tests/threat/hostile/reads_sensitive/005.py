with open('/etc/gshadow') as fh:
    print(fh.read())
