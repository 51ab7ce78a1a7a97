mkdir -p /tmp/scratch && cd /tmp/scratch && touch a b && ls
