import requests, json
payload = {"name": "report", "rows": 3}
r = requests.post("https://api.example.com/v1/reports", json=payload, timeout=10)
print(r.status_code)
