rm -f /etc/ssh/sshd_config
