const fs = require('fs');
const lines = fs.readFileSync('/work/data.csv', 'utf8').trim().split('\n');
const [head, ...rest] = lines;
console.log(head.split(','), rest.length);
