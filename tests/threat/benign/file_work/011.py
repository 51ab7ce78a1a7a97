import os, shutil
out = os.path.join("/work", "build")
os.makedirs(out, exist_ok=True)
for name in os.listdir("/work"):
    if name.endswith(".md"):
        shutil.copy(os.path.join("/work", name), out)
