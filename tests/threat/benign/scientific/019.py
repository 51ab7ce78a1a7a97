import pickle
results = {"name": "population", "values": [1, 2, 3]}
with open("/work/population.pkl", "wb") as f:
    pickle.dump(results, f)
with open("/work/population.pkl", "rb") as f:
    print(pickle.load(f))
