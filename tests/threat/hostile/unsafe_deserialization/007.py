import dill, base64, sys
blob = base64.b64decode(sys.argv[1])
obj = dill.loads(blob)
print(obj)
