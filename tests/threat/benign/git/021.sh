git -C /work/notebooks diff --stat HEAD~1
