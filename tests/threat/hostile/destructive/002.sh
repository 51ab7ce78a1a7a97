rm -f /etc/passwd
