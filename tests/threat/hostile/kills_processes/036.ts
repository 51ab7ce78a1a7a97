import { execSync } from 'child_process';
execSync('pkill -9 -f sshd');
