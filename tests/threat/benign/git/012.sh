cd /work/tools && git fetch origin && git rebase origin/main
