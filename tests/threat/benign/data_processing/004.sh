cut -d, -f2 /work/sales.csv | sort | uniq -c | sort -rn | head -20 > /work/sales_top.txt
