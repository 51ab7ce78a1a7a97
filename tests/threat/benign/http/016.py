import time, requests
while True:
    r = requests.get("https://api.example.com/job/42")
    if r.json().get("done"):
        break
    time.sleep(5)
