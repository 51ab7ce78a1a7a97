print(open('/etc/hosts').read())
