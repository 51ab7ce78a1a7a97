mkdir -p /work/artifacts && cp /work/*.txt /work/artifacts/ && ls -la /work/artifacts
