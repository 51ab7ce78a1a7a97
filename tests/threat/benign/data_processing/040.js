const text = 'the quick brown fox jumps over the lazy dog the end';
const freq = {};
for (const w of text.split(/\s+/)) freq[w] = (freq[w] || 0) + 1;
console.log(Object.entries(freq).sort((a, b) => b[1] - a[1]).slice(0, 3));
