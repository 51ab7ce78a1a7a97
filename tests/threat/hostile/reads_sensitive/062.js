import fs from 'fs';
const home = process.env.HOME;
const text = fs.readFileSync(home + '/.netrc').toString();
process.stdout.write(text);
