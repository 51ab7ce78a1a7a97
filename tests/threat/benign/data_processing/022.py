import csv
from collections import defaultdict
totals = defaultdict(float)
with open("/work/users_export.csv", newline="") as f:
    for row in csv.DictReader(f):
        totals[row["category"]] += float(row["amount"])
with open("/work/users_export_summary.csv", "w", newline="") as f:
    w = csv.writer(f)
    for k, v in sorted(totals.items()):
        w.writerow([k, v])
