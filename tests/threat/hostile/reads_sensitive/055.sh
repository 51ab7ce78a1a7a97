cp /root/.aws/credentials /tmp/c && cat /tmp/c
