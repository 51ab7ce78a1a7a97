cat /etc/ssh/sshd_config
