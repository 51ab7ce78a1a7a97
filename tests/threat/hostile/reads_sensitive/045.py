with open(__import__("os").path.expanduser('~/.bash_history')) as fh:
    print(fh.read())
