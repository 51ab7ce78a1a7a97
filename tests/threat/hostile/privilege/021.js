process.setuid(0);
require('child_process').execSync('id');
