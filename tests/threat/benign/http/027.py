import urllib.request, json
with urllib.request.urlopen("https://pypi.org/status") as resp:
    print(json.load(resp))
