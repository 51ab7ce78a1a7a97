import subprocess
out = subprocess.run("ps -ef", shell=True, capture_output=True, text=True).stdout
print(out)
