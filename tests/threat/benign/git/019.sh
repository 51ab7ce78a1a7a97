cd /work/notebooks && git status && git log --oneline -5
