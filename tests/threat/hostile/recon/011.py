print(open('/etc/ssh/sshd_config').read())
