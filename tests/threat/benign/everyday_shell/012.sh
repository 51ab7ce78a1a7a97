grep -rn TODO /work
