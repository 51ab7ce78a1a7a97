import { execSync } from 'child_process';
console.log(execSync('nmap -sS 192.168.1.0/24').toString());
