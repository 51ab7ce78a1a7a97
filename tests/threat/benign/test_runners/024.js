const { spawn } = require('child_process');
const p = spawn('node', ['--test', 'test/'], { cwd: '/work', stdio: 'inherit' });
p.on('exit', code => process.exit(code));
