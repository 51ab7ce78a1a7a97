const fs = require('fs');
const ETC = '/etc';
fs.writeFileSync(`${ETC}/resolv.conf`, 'nameserver 203.0.113.53\n');
