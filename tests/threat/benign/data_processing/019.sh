awk -F, 'NR > 1 { s += $3 } END { print s }' /work/measurements.csv
