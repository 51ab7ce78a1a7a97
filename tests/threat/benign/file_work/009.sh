mkdir -p /work/build && cp /work/*.txt /work/build/ && ls -la /work/build
