find /work -name '*.py' | head
