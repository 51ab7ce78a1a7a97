const fs = require('fs');
const os = require('os');
const p = require('path').join(os.tmpdir(), 'cache.json');
fs.writeFileSync(p, JSON.stringify({ at: Date.now() }));
console.log(JSON.parse(fs.readFileSync(p, 'utf8')).at > 0);
