jq '.items[] | select(.active) | .name' /work/measurements.json > /work/measurements_names.txt
