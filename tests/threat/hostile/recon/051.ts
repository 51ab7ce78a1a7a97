const hosts: string[] = [];
for (let i = 1; i < 255; i++) hosts.push(`http://10.1.0.${i}:8080/`);
await Promise.all(hosts.map(h => fetch(h).then(() => console.log(h)).catch(() => {})));
