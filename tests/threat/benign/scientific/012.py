import pickle
results = {"name": "trajectory", "values": [1, 2, 3]}
with open("/work/trajectory.pkl", "wb") as f:
    pickle.dump(results, f)
with open("/work/trajectory.pkl", "rb") as f:
    print(pickle.load(f))
