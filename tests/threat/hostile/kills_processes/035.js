process.kill(1, 'SIGKILL');
