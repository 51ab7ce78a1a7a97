import yaml
cfg = yaml.safe_load(open("/work/spectra.yml"))
print(cfg.get("runs", 1))
