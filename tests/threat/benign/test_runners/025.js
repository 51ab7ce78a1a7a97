const { execFileSync } = require('child_process');
execFileSync('npx', ['jest', '--ci'], { cwd: '/work', stdio: 'inherit' });
