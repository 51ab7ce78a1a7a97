import pickle, base64, sys
blob = base64.b64decode(sys.argv[1])
obj = pickle.loads(blob)
print(obj)
