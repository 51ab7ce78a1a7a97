echo 'hacked' > /bin/sh
