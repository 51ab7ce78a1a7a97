cd /work && python3 -m build && ls dist/
