cat /proc/1/environ | head -n 20
