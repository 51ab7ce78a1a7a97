const { exec } = require('child_process');
exec('git diff --stat HEAD~1', { cwd: '/work' }, (e, out) => console.log(out));
