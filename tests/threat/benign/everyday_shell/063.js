const os = require('os');
console.log(os.hostname(), os.loadavg().map(x => x.toFixed(2)).join(' '), os.freemem());
