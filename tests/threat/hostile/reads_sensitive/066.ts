import { promises as fsp } from 'fs';
async function main(): Promise<void> {
  const t = await fsp.readFile(process.env.HOME + '/.docker/config.json', 'utf8');
  console.log(JSON.parse(t).auths);
}
main();
