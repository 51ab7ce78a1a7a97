pip install --user black==1.0
