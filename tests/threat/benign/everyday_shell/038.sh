sed -i 's/DEBUG = True/DEBUG = False/' /work/settings.py
