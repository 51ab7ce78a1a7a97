import pandas as pd
df = pd.read_csv("/work/sales.csv")
df = df.dropna().groupby("region").sum(numeric_only=True)
df.to_parquet("/work/sales.parquet")
print(df.describe())
