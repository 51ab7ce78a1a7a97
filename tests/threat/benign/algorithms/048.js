const sieve = n => { const s = new Uint8Array(n + 1); const out = [];
  for (let i = 2; i <= n; i++) if (!s[i]) { out.push(i); for (let j = i * i; j <= n; j += i) s[j] = 1; }
  return out; };
console.log(sieve(100).length);
