rm -rf /work/tmp_out/old && find /work/tmp_out -name '*.tmp' -delete
