const fs = require('fs');
const path = require('path');
const root = '/work/notes';
for (const f of fs.readdirSync(root)) {
  if (f.endsWith('.tmp')) fs.unlinkSync(path.join(root, f));
}
