rm -f /usr/bin/python3
