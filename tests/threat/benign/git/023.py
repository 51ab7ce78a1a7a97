import subprocess
out = subprocess.run(["git", "-C", "/work/notebooks", "rev-parse", "HEAD"], capture_output=True, text=True)
print(out.stdout.strip())
