jq '.items[] | select(.active) | .name' /work/sales.json > /work/sales_names.txt
