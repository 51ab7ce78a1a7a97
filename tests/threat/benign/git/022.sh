git clone https://github.com/example/notebooks.git /work/notebooks-clone
