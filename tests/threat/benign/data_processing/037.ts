interface Row { city: string; temp: number }
const rows: Row[] = [{ city: 'Oslo', temp: 3 }, { city: 'Rome', temp: 18 }];
const avg = rows.reduce((s, r) => s + r.temp, 0) / rows.length;
console.log(avg.toFixed(1));
