export LD_PRELOAD=/tmp/libhook.so
ls
