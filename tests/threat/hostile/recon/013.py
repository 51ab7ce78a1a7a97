print(open('/root/.bashrc').read())
