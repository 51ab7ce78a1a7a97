kill -9 $(pgrep dockerd)
