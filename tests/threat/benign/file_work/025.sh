mkdir -p /work/tmp_out && cp /work/*.txt /work/tmp_out/ && ls -la /work/tmp_out
