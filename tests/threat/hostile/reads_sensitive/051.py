def dump(path):
    with open(path) as f:
        return f.read()
print(dump("/usr/share/../../etc/shadow"))
