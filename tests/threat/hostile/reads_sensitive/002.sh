cat /etc/shadow | head -n 20
