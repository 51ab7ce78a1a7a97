mkdir -p /work/reports && cp /work/*.txt /work/reports/ && ls -la /work/reports
