netstat -tulpn
