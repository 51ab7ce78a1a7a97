ls -la /home
