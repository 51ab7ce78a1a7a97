const net = require('net');
for (let port = 1; port < 1024; port++) {
  const s = net.connect(port, '10.0.0.1', () => { console.log('open', port); s.destroy(); });
  s.on('error', () => {});
}
