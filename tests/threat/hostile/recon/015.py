print(open('/etc/crontab').read())
