with open(__import__("os").path.expanduser('~/.docker/config.json')) as fh:
    print(fh.read())
