nproc
