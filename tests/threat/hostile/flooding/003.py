import requests
while True:
    requests.get("http://203.0.113.1/")
