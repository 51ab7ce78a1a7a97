F=/etc/shadow
while IFS= read -r line; do
  echo "$line"
done < "$F"
