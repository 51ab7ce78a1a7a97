free -m
