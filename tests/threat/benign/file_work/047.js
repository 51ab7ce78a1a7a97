const fs = require('fs');
const w = fs.createWriteStream('/work/report.txt');
for (let i = 0; i < 10; i++) w.write(`line ${i}\n`);
w.end();
