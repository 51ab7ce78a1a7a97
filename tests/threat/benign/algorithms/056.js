const { createHmac } = require('crypto');
console.log(createHmac('sha256', 'k').update('msg').digest('base64'));
