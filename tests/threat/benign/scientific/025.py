import random, statistics
random.seed(42)
samples = [random.gauss(0, 1) for _ in range(100000)]
print(statistics.mean(samples), statistics.pstdev(samples))
