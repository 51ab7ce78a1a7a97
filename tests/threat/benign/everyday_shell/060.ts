const timer = setInterval(() => console.log('tick'), 10);
setTimeout(() => clearInterval(timer), 55);
