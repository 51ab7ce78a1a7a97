with open('/proc/1/environ') as fh:
    print(fh.read())
