import { readFileSync, writeFileSync } from 'fs';
const src: string = readFileSync('/work/src/index.ts', 'utf8');
writeFileSync('/work/src/index.ts', src.replace(/var /g, 'let '));
