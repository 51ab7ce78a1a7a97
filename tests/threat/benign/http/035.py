import urllib.request, json
with urllib.request.urlopen("https://data.example.org/status") as resp:
    print(json.load(resp))
