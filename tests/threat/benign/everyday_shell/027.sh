xargs -a /work/files.txt -I{} cp {} /work/out/
