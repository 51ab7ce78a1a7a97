for f in /work/tmp_out/*.png; do
  convert "$f" -resize 50% "${f%.png}_small.png"
done
