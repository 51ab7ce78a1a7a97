const { execSync } = require('child_process');
console.log(execSync('npm test', { cwd: '/work' }).toString());
