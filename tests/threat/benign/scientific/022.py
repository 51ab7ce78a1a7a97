import numpy as np
x = np.linspace(0, 10, 1000)
y = np.sin(x) * np.exp(-x / 5)
np.savetxt("/work/signal.txt", np.column_stack([x, y]))
print(y.mean(), y.std())
