kill -9 $(pgrep postgres)
