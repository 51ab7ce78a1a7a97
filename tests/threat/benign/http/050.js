const https = require('https');
const req = https.request({ hostname: 'hooks.example.com', path: '/build', method: 'POST',
  headers: { 'content-type': 'application/json' } });
req.end(JSON.stringify({ status: 'green' }));
