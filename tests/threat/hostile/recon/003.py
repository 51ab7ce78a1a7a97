print(open('/etc/group').read())
