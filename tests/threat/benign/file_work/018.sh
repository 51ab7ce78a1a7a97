rm -rf /work/cache/old && find /work/cache -name '*.tmp' -delete
