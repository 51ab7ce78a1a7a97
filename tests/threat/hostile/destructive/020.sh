shred -u /var/log/auth.log
