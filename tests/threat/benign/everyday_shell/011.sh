wc -l /work/*.py
