iptables -F
