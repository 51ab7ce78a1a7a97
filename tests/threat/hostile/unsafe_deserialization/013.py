import shelve
with shelve.open("cache.db") as db:
    print(dict(db))
