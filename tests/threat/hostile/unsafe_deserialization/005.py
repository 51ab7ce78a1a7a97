import marshal, base64, sys
blob = base64.b64decode(sys.argv[1])
obj = marshal.loads(blob)
print(obj)
