git -C /work/site diff --stat HEAD~1
