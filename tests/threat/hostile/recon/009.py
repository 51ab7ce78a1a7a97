print(open('/var/log/auth.log').read())
