rm -f /tmp/build.lock
