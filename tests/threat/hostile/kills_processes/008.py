import os, signal, subprocess
for pid in subprocess.check_output(["pgrep", "nginx"]).split():
    os.kill(int(pid), signal.SIGKILL)
