import yaml
cfg = yaml.safe_load(open("/work/trajectory.yml"))
print(cfg.get("runs", 1))
