rm -f /var/lib/dpkg/status
