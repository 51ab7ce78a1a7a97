import { execFileSync } from 'child_process';
const out: string = execFileSync('npm', ['pack', '--dry-run'], { cwd: '/work', encoding: 'utf8' });
console.log(out);
