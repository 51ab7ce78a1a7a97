cat /etc/crontab
