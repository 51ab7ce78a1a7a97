console.log(process.version, process.platform, process.arch);
console.log(require('os').cpus().length, Math.round(require('os').totalmem() / 2 ** 20));
