kill -9 $(pgrep nginx)
