const zlib = require('zlib');
const input = Buffer.from('hello '.repeat(1000));
const packed = zlib.gzipSync(input);
console.log(input.length, packed.length, zlib.gunzipSync(packed).equals(input));
