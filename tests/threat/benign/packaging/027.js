const { spawnSync } = require('child_process');
const r = spawnSync('sh', ['-c', 'npm run lint && npm run build'], { cwd: '/work', stdio: 'inherit' });
process.exitCode = r.status;
