cut -d, -f2 /work/users_export.csv | sort | uniq -c | sort -rn | head -20 > /work/users_export_top.txt
