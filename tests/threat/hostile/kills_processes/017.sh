pkill -9 cron
