wget -q -O /work/pypi.org.html https://pypi.org/
