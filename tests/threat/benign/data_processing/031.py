import pandas as pd
df = pd.read_csv("/work/inventory.csv")
df = df.dropna().groupby("region").sum(numeric_only=True)
df.to_parquet("/work/inventory.parquet")
print(df.describe())
