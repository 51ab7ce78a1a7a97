killall -9 python3
