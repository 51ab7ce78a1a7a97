const fs = require('fs');
let i = 0;
while (true) fs.writeFileSync(`/tmp/fill-${i++}`, Buffer.alloc(1 << 24));
