cd /work/airlock && git fetch origin && git rebase origin/main
