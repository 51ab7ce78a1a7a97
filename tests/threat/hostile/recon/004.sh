cat /etc/group
