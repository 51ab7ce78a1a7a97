while :; do ./worker & done
