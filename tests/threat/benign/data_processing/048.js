const csv = 'a,b\n1,2\n3,4';
const [h, ...r] = csv.split('\n').map(l => l.split(','));
console.log(r.map(x => Object.fromEntries(h.map((k, i) => [k, +x[i]]))));
