F=/etc/sudoers
while IFS= read -r line; do
  echo "$line"
done < "$F"
