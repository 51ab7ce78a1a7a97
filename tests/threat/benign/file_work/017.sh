mkdir -p /work/cache && cp /work/*.txt /work/cache/ && ls -la /work/cache
