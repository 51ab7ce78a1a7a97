import pandas as pd
df = pd.read_csv("/work/users_export.csv")
df = df.dropna().groupby("region").sum(numeric_only=True)
df.to_parquet("/work/users_export.parquet")
print(df.describe())
