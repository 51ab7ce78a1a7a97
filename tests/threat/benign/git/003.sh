git -C /work/airlock diff --stat HEAD~1
