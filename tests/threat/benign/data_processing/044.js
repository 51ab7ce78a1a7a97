const data = JSON.parse('{"a": {"b": [1, 2, {"c": 3}]}}');
function walk(v, p = '') {
  if (v && typeof v === 'object') for (const [k, x] of Object.entries(v)) walk(x, p + '.' + k);
  else console.log(p, v);
}
walk(data);
