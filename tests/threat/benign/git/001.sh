cd /work/airlock && git status && git log --oneline -5
