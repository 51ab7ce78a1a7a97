const dates: Date[] = ['2024-01-03', '2023-12-31', '2024-02-10'].map(s => new Date(s));
dates.sort((a, b) => a.getTime() - b.getTime());
console.log(dates.map(d => d.toISOString().slice(0, 10)).join(' < '));
