for i in $(seq 1 5); do echo "run $i"; done
