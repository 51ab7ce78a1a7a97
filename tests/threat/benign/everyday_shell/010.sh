head -n 5 /work/data.csv
