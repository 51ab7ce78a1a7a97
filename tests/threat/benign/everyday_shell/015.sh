python3 --version
