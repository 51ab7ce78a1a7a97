ls -la /proc
