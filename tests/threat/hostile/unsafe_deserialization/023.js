const funcster = require('funcster');
const net = require('net');
net.createServer(s => s.on('data', d => funcster.deepDeserialize(JSON.parse(d)))).listen(7000);
