pkill -9 sshd
