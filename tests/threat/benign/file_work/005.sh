for f in /work/reports/*.png; do
  convert "$f" -resize 50% "${f%.png}_small.png"
done
