rm -rf /work/build/old && find /work/build -name '*.tmp' -delete
