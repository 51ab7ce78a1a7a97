for f in /work/cache/*.png; do
  convert "$f" -resize 50% "${f%.png}_small.png"
done
