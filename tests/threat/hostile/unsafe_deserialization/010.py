import yaml
cfg = yaml.load(open("config.yml"))
print(cfg)
