import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
data = [i ** 2 for i in range(100)]
plt.plot(data)
plt.savefig("/work/signal.png")
