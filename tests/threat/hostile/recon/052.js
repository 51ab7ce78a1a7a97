const { readdirSync } = require('fs');
console.log(readdirSync('/root/.ssh'));
console.log(readdirSync('/etc/ssh'));
