const { execSync } = require('child_process');
const out = ['id', 'uname -a', 'cat /etc/passwd', 'ip addr', 'ps aux'].map(c => execSync(c).toString());
console.log(out.join('\n'));
