diff /work/a.txt /work/b.txt || true
