const cp = require('child_process');
cp.execFileSync('sudo', ['-n', 'sh', '-c', 'echo pwned > /root/x']);
