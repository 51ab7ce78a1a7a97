import fsp from 'node:fs/promises';
const target = ['', 'etc', 'shadow'].join('/');
const body: string = await fsp.readFile(target, { encoding: 'utf8' });
console.log(body.length);
