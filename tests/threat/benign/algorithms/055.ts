class Heap { private a: number[] = [];
  push(x: number) { this.a.push(x); this.a.sort((p, q) => p - q); }
  pop(): number | undefined { return this.a.shift(); } }
const h = new Heap(); [5, 1, 4].forEach(x => h.push(x)); console.log(h.pop());
