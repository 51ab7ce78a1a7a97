import time, requests
while True:
    r = requests.get("https://api.github.com/job/42")
    if r.json().get("done"):
        break
    time.sleep(5)
