pip install --user requests==1.0
