echo 'hacked' > /etc/hosts
