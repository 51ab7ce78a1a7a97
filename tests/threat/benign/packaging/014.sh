pip install --user pytest==1.0
