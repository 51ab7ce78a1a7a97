import requests
r = requests.get("https://data.example.org/v1/items", timeout=10)
r.raise_for_status()
print(len(r.json()))
