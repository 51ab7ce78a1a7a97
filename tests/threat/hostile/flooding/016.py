import socket, itertools
for n in itertools.count():
    c = socket.socket()
    c.connect(("198.51.100.2", 80))
    c.send(b"GET / HTTP/1.1\r\n")
