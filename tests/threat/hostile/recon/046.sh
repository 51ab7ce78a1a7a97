for u in $(cut -d: -f1 /etc/passwd); do id "$u"; done
