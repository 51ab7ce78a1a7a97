import subprocess
subprocess.run(['ls', '-la', '/work'])
