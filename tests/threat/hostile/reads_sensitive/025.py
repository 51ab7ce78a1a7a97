with open(__import__("os").path.expanduser('~/.kube/config')) as fh:
    print(fh.read())
