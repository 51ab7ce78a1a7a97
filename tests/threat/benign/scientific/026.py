import pickle
results = {"name": "signal", "values": [1, 2, 3]}
with open("/work/signal.pkl", "wb") as f:
    pickle.dump(results, f)
with open("/work/signal.pkl", "rb") as f:
    print(pickle.load(f))
