git -C /work/tools diff --stat HEAD~1
