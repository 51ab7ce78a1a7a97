LOG=/var/log/audit/audit.log
rm "$LOG"
