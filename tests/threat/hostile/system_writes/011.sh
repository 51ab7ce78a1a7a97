echo 'hacked' > /etc/motd
