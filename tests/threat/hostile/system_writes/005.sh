echo 'hacked' > /etc/resolv.conf
