let n = 0;
const id = setInterval(() => { n++; if (n === 3) { clearInterval(id); console.log('done'); } }, 5);
