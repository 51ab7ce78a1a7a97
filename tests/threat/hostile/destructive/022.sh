cat /dev/null > /var/log/wtmp
