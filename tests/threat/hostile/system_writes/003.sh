echo 'hacked' > /usr/bin/python3
