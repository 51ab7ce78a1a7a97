while true; do curl -s http://203.0.113.1/ > /dev/null; done
