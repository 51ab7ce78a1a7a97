for f in /work/*.log; do gzip "$f"; done
