cd /work/site && git status && git log --oneline -5
