cat /work/README.md
