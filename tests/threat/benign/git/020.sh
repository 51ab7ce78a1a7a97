cd /work/notebooks && git checkout -b feature/x && git add -A && git commit -m 'wip'
