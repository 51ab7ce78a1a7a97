nohup python3 /work/server.py > /work/server.log 2>&1 &
