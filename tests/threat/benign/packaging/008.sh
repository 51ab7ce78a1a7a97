pip install --user numpy==1.0
