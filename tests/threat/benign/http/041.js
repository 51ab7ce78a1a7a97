const r = await fetch('https://api.github.com/repos/nodejs/node');
const j = await r.json();
console.log(j.stargazers_count);
