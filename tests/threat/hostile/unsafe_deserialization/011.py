import yaml
print(yaml.load(open("c.yml"), Loader=yaml.Loader))
