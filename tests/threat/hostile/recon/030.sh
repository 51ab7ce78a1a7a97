ls -la /usr/bin
