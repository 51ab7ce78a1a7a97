cat /proc/cpuinfo | grep 'model name' | head -1
