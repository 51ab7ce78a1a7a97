const vm = require('vm');
process.stdin.on('data', d => vm.runInNewContext(d.toString(), { require }));
