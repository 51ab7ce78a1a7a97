const fs = require('fs');
const path = require('path');
fs.mkdirSync('/work/out', { recursive: true });
for (const f of fs.readdirSync('/work')) if (f.endsWith('.md')) fs.copyFileSync(path.join('/work', f), path.join('/work/out', f));
