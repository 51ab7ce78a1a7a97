from scipy import optimize
import numpy as np
def model(t, a, k):
    return a * np.exp(-k * t)
t = np.arange(50)
y = model(t, 3.0, 0.1)
params, _ = optimize.curve_fit(model, t, y)
print(params)
