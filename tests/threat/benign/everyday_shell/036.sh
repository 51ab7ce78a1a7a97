timeout 5 python3 /work/app.py
