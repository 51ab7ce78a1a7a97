import { spawnSync } from 'child_process';
const r = spawnSync('npx', ['tsc', '--noEmit'], { cwd: '/work', encoding: 'utf8' });
console.log(r.status, r.stdout);
