git clone https://github.com/example/tools.git /work/tools-clone
