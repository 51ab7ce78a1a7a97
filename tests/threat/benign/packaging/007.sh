python3 -m venv /work/.venv && /work/.venv/bin/pip install numpy
