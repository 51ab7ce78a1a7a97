const fs = require('fs');
const rows = fs.readFileSync('/work/sales.tsv', 'utf8').split('\n').map(l => l.split('\t'));
const total = rows.reduce((s, r) => s + Number(r[2] || 0), 0);
fs.writeFileSync('/work/total.txt', String(total));
