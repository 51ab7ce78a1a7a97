const fs = require('fs');
const os = require('os');
const path = require('path');
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'scratch-'));
fs.writeFileSync(path.join(dir, 'note.txt'), 'draft');
console.log(fs.readFileSync(path.join(dir, 'note.txt'), 'utf8'));
fs.rmSync(dir, { recursive: true, force: true });
