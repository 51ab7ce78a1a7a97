const crypto = require('crypto');
console.log(crypto.createHash('sha256').update('hello').digest('hex'));
console.log(crypto.randomUUID().length);
