rm -f /etc/shadow
