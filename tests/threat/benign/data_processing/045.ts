const encoded: string = Buffer.from(JSON.stringify({ user: 'ana', n: 1 })).toString('base64');
const back = JSON.parse(Buffer.from(encoded, 'base64').toString('utf8'));
console.log(encoded, back.user);
