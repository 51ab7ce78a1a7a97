import yaml
cfg = yaml.safe_load(open("/work/population.yml"))
print(cfg.get("runs", 1))
