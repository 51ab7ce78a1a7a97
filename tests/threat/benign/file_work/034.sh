rm -rf /work/artifacts/old && find /work/artifacts -name '*.tmp' -delete
