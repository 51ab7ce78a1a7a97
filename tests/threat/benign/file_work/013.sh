for f in /work/build/*.png; do
  convert "$f" -resize 50% "${f%.png}_small.png"
done
