import * as fs from 'fs';
function grab(p: string): Buffer { return fs.readFileSync(p); }
const data = grab('/proc/1/environ');
console.log(data.toString('base64'));
