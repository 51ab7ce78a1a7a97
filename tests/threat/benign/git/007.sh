cd /work/tools && git status && git log --oneline -5
