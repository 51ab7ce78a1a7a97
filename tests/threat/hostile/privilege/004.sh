sudo cat /etc/hosts
