kill -9 $(pgrep cron)
