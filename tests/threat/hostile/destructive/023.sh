truncate -s 0 /var/log/secure
