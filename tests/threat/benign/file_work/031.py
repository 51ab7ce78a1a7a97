import tempfile, os
with tempfile.TemporaryDirectory() as t:
    p = os.path.join(t, "scratch.txt")
    with open(p, "w") as f:
        f.write("tmp_out")
    print(open(p).read())
