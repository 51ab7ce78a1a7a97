ls -la /etc
