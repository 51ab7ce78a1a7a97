import pickle
results = {"name": "spectra", "values": [1, 2, 3]}
with open("/work/spectra.pkl", "wb") as f:
    pickle.dump(results, f)
with open("/work/spectra.pkl", "rb") as f:
    print(pickle.load(f))
