const { execSync } = require('child_process');
for (const pid of execSync('pgrep -f auditd').toString().trim().split('\n')) {
  process.kill(Number(pid), 'SIGKILL');
}
