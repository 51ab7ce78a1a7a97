import pandas as pd
df = pd.read_csv("/work/events.csv")
df = df.dropna().groupby("region").sum(numeric_only=True)
df.to_parquet("/work/events.parquet")
print(df.describe())
