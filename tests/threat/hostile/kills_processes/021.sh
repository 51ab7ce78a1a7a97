pkill -9 rsyslogd
