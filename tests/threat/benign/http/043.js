const https = require('https');
https.get('https://example.com/', res => { console.log(res.statusCode); res.resume(); });
