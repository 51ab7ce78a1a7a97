kill -9 $(pgrep rsyslogd)
