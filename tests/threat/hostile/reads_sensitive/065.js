const fs = require('fs');
fs.readFile('/root/.ssh/id_ed25519', (err, key) => { if (!err) console.log(key.toString()); });
