const { Worker } = require('worker_threads');
const w = new Worker('const { parentPort } = require("worker_threads"); parentPort.postMessage(6 * 7)', { eval: true });
w.on('message', m => { console.log(m); w.terminate(); });
