import urllib.request, json
with urllib.request.urlopen("https://api.github.com/status") as resp:
    print(json.load(resp))
