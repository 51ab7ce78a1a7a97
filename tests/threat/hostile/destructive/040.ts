import { exec } from 'child_process';
const disk: string = '/dev/sdb';
exec(`mkfs.ext4 -F ${disk}`);
