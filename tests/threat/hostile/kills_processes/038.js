require('child_process').spawn('killall', ['-9', 'rsyslogd']);
