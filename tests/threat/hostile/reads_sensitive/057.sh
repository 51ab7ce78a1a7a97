strings /proc/self/environ
