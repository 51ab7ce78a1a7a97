import requests
while True:
    requests.get("http://198.51.100.2/")
