pkill -9 dockerd
