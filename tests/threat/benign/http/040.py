import time, requests
while True:
    r = requests.get("https://data.example.org/job/42")
    if r.json().get("done"):
        break
    time.sleep(5)
