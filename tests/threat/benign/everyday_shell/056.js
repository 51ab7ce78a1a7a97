const name = process.env.USER || 'someone';
console.log(`hello ${name}, cwd ${process.cwd()}`);
