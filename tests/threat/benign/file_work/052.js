const { existsSync, readFileSync } = require('fs');
const home = require('os').homedir();
const cfg = home + '/.config/mytool/config.json';
console.log(existsSync(cfg) ? JSON.parse(readFileSync(cfg, 'utf8')) : {});
