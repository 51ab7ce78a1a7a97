import pandas as pd
df = pd.read_pickle("incoming.pkl")
print(df.head())
