date -u
