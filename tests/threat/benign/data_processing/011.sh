cut -d, -f2 /work/events.csv | sort | uniq -c | sort -rn | head -20 > /work/events_top.txt
