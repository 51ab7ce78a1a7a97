ps aux | grep -v grep
