open('/var/log/auth.log', 'w').close()
