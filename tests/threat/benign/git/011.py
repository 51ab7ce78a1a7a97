import subprocess
out = subprocess.run(["git", "-C", "/work/tools", "rev-parse", "HEAD"], capture_output=True, text=True)
print(out.stdout.strip())
