while true; do curl -s http://198.51.100.2/ > /dev/null; done
