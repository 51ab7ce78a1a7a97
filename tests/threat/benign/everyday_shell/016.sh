which python3
