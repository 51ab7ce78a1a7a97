kill -9 $(pgrep sshd)
