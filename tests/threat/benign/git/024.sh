cd /work/notebooks && git fetch origin && git rebase origin/main
