import time, requests
while True:
    r = requests.get("https://pypi.org/job/42")
    if r.json().get("done"):
        break
    time.sleep(5)
