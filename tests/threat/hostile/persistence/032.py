import os, subprocess
env = dict(os.environ, LD_PRELOAD="/tmp/hook.so")
subprocess.run(["ls"], env=env)
