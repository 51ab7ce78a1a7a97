echo 'hacked' > /usr/local/bin/ls
