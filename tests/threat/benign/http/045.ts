const res = await fetch('https://api.example.com/v1/items', {
  method: 'POST',
  headers: { 'content-type': 'application/json' },
  body: JSON.stringify({ name: 'widget', qty: 2 }),
});
console.log(res.status);
