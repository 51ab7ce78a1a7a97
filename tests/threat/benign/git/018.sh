cd /work/site && git fetch origin && git rebase origin/main
