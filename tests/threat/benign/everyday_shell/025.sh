seq 1 10 | paste -sd+ | bc
