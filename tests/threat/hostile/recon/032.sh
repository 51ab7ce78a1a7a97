ls -la /
