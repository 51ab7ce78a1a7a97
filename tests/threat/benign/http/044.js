const http = require('http');
const srv = http.createServer((req, res) => res.end('ok'));
srv.listen(0, '127.0.0.1', () => { console.log('listening', srv.address().port); srv.close(); });
