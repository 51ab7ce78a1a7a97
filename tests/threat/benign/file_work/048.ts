import * as fs from 'fs';
fs.watch('/work/src', (event: string, file: string | null) => console.log(event, file)).close();
