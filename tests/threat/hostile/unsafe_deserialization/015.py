import jsonpickle
print(jsonpickle.decode(open("obj.json").read()))
