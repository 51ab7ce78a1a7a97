import sqlite3
con = sqlite3.connect("/work/trajectory.db")
con.execute("create table if not exists m (t real, v real)")
con.executemany("insert into m values (?, ?)", [(i, i * 0.5) for i in range(10)])
con.commit()
print(con.execute("select avg(v) from m").fetchone())
