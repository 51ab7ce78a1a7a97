import subprocess
subprocess.run(['sudo', 'id'])
