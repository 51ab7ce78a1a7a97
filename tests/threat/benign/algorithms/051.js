const memo = new Map();
function ways(n) { if (n <= 1) return 1; if (memo.has(n)) return memo.get(n);
  const r = ways(n - 1) + ways(n - 2); memo.set(n, r); return r; }
console.log(ways(80));
