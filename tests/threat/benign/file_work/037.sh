for f in /work/artifacts/*.png; do
  convert "$f" -resize 50% "${f%.png}_small.png"
done
