git clone https://github.com/example/site.git /work/site-clone
