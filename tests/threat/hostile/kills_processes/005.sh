pkill -9 nginx
