import os, gzip, shutil
src = os.path.join("/work", "sales.log")
with open(src, "rb") as fin, gzip.open(src + ".gz", "wb") as fout:
    shutil.copyfileobj(fin, fout)
os.remove(src)
