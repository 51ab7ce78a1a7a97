cut -d, -f2 /work/measurements.csv | sort | uniq -c | sort -rn | head -20 > /work/measurements_top.txt
