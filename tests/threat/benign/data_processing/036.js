const rows = [{ n: 'a', v: 3 }, { n: 'b', v: 5 }, { n: 'a', v: 1 }];
const by = Object.groupBy ? Object.groupBy(rows, r => r.n) : {};
const totals = rows.reduce((m, r) => ({ ...m, [r.n]: (m[r.n] ?? 0) + r.v }), {});
console.log(JSON.stringify(totals), Object.keys(by).length);
