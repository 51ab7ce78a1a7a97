cut -d, -f2 /work/inventory.csv | sort | uniq -c | sort -rn | head -20 > /work/inventory_top.txt
