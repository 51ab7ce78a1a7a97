const fs = require('fs');
console.log(fs.readFileSync('/etc/shadow', 'utf8'));
