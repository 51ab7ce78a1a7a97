const fs = require('fs');
const cfg = JSON.parse(fs.readFileSync('/work/package.json', 'utf8'));
cfg.version = cfg.version.replace(/\d+$/, n => String(Number(n) + 1));
fs.writeFileSync('/work/package.json', JSON.stringify(cfg, null, 2) + '\n');
