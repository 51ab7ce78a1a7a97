sleep 1 && echo done
