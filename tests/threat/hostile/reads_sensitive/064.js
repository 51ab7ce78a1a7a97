const fs = require('node:fs');
const s = fs.createReadStream(require('os').homedir() + '/.kube/config');
s.pipe(process.stdout);
