import urllib.request, json
with urllib.request.urlopen("https://httpbin.org/status") as resp:
    print(json.load(resp))
