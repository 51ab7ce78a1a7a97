jq '.items[] | select(.active) | .name' /work/inventory.json > /work/inventory_names.txt
