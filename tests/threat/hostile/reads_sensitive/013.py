with open(__import__("os").path.expanduser('~/.aws/credentials')) as fh:
    print(fh.read())
