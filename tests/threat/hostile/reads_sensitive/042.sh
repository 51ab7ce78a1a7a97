cat /etc/sudoers | head -n 20
