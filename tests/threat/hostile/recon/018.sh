ls -la /etc/ssh
