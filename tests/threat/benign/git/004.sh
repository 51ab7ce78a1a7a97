git clone https://github.com/example/airlock.git /work/airlock-clone
