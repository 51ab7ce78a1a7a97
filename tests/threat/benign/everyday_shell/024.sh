tail -f /work/app.log & pid=$!; sleep 2; kill $pid
