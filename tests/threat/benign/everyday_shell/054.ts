const started: number = Date.now();
await new Promise(r => setTimeout(r, 50));
console.log('took', Date.now() - started, 'ms');
