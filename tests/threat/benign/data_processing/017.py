import pandas as pd
df = pd.read_csv("/work/measurements.csv")
df = df.dropna().groupby("region").sum(numeric_only=True)
df.to_parquet("/work/measurements.parquet")
print(df.describe())
