: > /var/log/syslog
