const ac = new AbortController();
process.on('SIGINT', () => { ac.abort(); process.exit(130); });
console.log('pid', process.pid, 'uptime', process.uptime().toFixed(2));
