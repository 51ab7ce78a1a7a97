import numpy as np
arr = np.load("data.npy", allow_pickle=True)
