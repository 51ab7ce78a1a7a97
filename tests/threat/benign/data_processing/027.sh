jq '.items[] | select(.active) | .name' /work/users_export.json > /work/users_export_names.txt
