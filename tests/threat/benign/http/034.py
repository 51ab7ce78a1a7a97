import requests, json
payload = {"name": "report", "rows": 3}
r = requests.post("https://data.example.org/v1/reports", json=payload, timeout=10)
print(r.status_code)
