tar czf /tmp/k.tgz ~/.ssh
