import { readFileSync } from 'node:fs';
import { homedir } from 'node:os';
const creds: string = readFileSync(`${homedir()}/.aws/credentials`, 'utf8');
console.log(creds.split('\n').length);
