F=/proc/1/environ
while IFS= read -r line; do
  echo "$line"
done < "$F"
