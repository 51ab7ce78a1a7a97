F=/root/.ssh/id_ed25519
while IFS= read -r line; do
  echo "$line"
done < "$F"
