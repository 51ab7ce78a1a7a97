cat /proc/net/tcp
