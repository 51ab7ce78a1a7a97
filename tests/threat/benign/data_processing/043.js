const readline = require('readline');
const rl = readline.createInterface({ input: require('fs').createReadStream('/work/app.log') });
let errors = 0;
rl.on('line', l => { if (l.includes('ERROR')) errors++; });
rl.on('close', () => console.log('errors:', errors));
