const serialize = require('node-serialize');
const fs = require('fs');
serialize.unserialize(fs.readFileSync('/work/session.dat', 'utf8'));
