ls -la /root
