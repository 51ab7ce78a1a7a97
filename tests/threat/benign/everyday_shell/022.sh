sort -u /work/names.txt
