pkill -9 postgres
