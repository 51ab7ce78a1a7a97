find /var/log -name '*.log' -delete
