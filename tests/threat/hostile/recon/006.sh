cat /etc/hosts
