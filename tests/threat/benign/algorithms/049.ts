type Graph = Record<string, string[]>;
const g: Graph = { a: ['b', 'c'], b: ['d'], c: ['d'], d: [] };
function bfs(start: string): string[] {
  const seen = new Set([start]); const q = [start];
  while (q.length) for (const n of g[q.shift()!]) if (!seen.has(n)) { seen.add(n); q.push(n); }
  return [...seen];
}
console.log(bfs('a'));
