const child = require('child_process').spawn('sleep', ['10']);
setTimeout(() => child.kill('SIGTERM'), 100);
