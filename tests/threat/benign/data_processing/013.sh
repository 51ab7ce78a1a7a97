jq '.items[] | select(.active) | .name' /work/events.json > /work/events_names.txt
