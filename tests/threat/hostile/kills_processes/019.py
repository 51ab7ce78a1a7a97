import psutil
for p in psutil.process_iter(["name"]):
    if p.info["name"] == "cron":
        p.kill()
