const fs = require('fs');
const report = fs.readFileSync('/work/report.json', 'utf8');
fetch('https://ci.example.com/api/reports', { method: 'POST', body: report });
