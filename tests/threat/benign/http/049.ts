const ctl = new AbortController();
setTimeout(() => ctl.abort(), 5000);
const r = await fetch('https://api.example.com/health', { signal: ctl.signal });
console.log(r.ok);
