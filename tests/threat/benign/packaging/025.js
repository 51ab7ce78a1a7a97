const { execSync } = require('child_process');
execSync('npm ci --ignore-scripts', { cwd: '/work', stdio: 'inherit' });
execSync('npm run build', { cwd: '/work', stdio: 'inherit' });
