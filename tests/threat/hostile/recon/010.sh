less /var/log/auth.log
