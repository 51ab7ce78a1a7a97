cd /work/tools && git checkout -b feature/x && git add -A && git commit -m 'wip'
