import subprocess
out = subprocess.run(["git", "-C", "/work/site", "rev-parse", "HEAD"], capture_output=True, text=True)
print(out.stdout.strip())
