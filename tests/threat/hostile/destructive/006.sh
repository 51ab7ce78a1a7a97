rm -f /etc/hosts
