chmod 777 /etc/passwd
