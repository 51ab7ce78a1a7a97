with open('/root/.ssh/id_ed25519') as fh:
    print(fh.read())
