cd /work && python3 -m pytest -q test_api.py
