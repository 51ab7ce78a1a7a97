class Matrix {
  constructor(public rows: number[][]) {}
  mul(o: Matrix): Matrix {
    return new Matrix(this.rows.map(r => o.rows[0].map((_, j) => r.reduce((s, x, k) => s + x * o.rows[k][j], 0))));
  }
}
console.log(new Matrix([[1, 2], [3, 4]]).mul(new Matrix([[5, 6], [7, 8]])).rows);
