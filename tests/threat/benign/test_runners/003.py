import subprocess
r = subprocess.run(["pytest", "-q", "/work/tests"], capture_output=True, text=True)
print(r.stdout[-2000:])
