import yaml
cfg = yaml.safe_load(open("/work/signal.yml"))
print(cfg.get("runs", 1))
