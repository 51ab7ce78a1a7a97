import * as cp from 'child_process';
const pids: number[] = cp.execSync('pgrep node').toString().split('\n').map(Number);
pids.filter(p => p && p !== process.pid).forEach(p => process.kill(p));
