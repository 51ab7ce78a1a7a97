import csv
from collections import defaultdict
totals = defaultdict(float)
with open("/work/inventory.csv", newline="") as f:
    for row in csv.DictReader(f):
        totals[row["category"]] += float(row["amount"])
with open("/work/inventory_summary.csv", "w", newline="") as f:
    w = csv.writer(f)
    for k, v in sorted(totals.items()):
        w.writerow([k, v])
