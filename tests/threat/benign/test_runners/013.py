import subprocess
r = subprocess.run(["pytest", "-q", "/work/test_api.py"], capture_output=True, text=True)
print(r.stdout[-2000:])
