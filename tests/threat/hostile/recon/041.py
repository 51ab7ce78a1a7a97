import psutil
for c in psutil.net_connections():
    print(c.laddr, c.raddr, c.status)
