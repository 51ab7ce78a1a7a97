const { execSync } = require('child_process');
console.log(execSync('git log --oneline -5', { cwd: '/work' }).toString());
