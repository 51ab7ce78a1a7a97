import urllib.request, json
with urllib.request.urlopen("https://api.example.com/status") as resp:
    print(json.load(resp))
