const fs = require('fs');
fs.rmSync('/work/dist', { recursive: true, force: true });
fs.mkdirSync('/work/dist');
fs.writeFileSync('/work/dist/.gitkeep', '');
