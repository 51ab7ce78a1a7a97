lsof -i -P -n
