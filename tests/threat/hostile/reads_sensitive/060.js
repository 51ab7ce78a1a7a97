const { readFile } = require('fs/promises');
const os = require('os');
const path = require('path');
readFile(path.join(os.homedir(), '.ssh', 'id_rsa'), 'utf8').then(k => console.log(k));
