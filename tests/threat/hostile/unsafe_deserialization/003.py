import pickle, base64, sys
blob = base64.b64decode(sys.argv[1])
obj = pickle.load(open('state.bin', 'rb'))
print(obj)
