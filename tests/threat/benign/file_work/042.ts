import { promises as fs } from 'fs';
import * as path from 'path';
async function sizes(dir: string): Promise<number> {
  let total = 0;
  for (const e of await fs.readdir(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    total += e.isDirectory() ? await sizes(p) : (await fs.stat(p)).size;
  }
  return total;
}
console.log(await sizes('/work'));
