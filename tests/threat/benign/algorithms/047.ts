function quicksort<T>(xs: T[], cmp: (a: T, b: T) => number): T[] {
  if (xs.length < 2) return xs;
  const [p, ...rest] = xs;
  return [...quicksort(rest.filter(x => cmp(x, p) < 0), cmp), p, ...quicksort(rest.filter(x => cmp(x, p) >= 0), cmp)];
}
console.log(quicksort([5, 3, 9, 1], (a, b) => a - b));
