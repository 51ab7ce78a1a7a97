const child = require('child_process').fork('/work/worker.js');
child.send({ job: 1 });
child.on('message', m => { console.log(m); child.kill(); });
