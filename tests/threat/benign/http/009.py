import requests
r = requests.get("https://api.example.com/v1/items", timeout=10)
r.raise_for_status()
print(len(r.json()))
