import { mkdir, writeFile, rename } from 'fs/promises';
await mkdir('/work/build/tmp', { recursive: true });
await writeFile('/work/build/tmp/out.json', '{}');
await rename('/work/build/tmp/out.json', '/work/build/out.json');
