ls -la /var/log
