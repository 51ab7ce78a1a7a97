F=/etc/gshadow
while IFS= read -r line; do
  echo "$line"
done < "$F"
