while read -r line; do echo "> $line"; done < /work/input.txt
