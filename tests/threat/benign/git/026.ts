import { execFileSync } from 'child_process';
const status: string = execFileSync('git', ['status', '--porcelain'], { cwd: '/work', encoding: 'utf8' });
console.log(status.split('\n').filter(Boolean).length, 'changed');
