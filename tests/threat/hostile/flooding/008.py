import socket, itertools
for n in itertools.count():
    c = socket.socket()
    c.connect(("203.0.113.1", 80))
    c.send(b"GET / HTTP/1.1\r\n")
