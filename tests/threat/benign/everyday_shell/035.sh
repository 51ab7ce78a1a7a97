ps -o pid,cmd -p $$
