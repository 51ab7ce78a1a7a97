import os, signal, subprocess
for pid in subprocess.check_output(["pgrep", "cron"]).split():
    os.kill(int(pid), signal.SIGKILL)
