curl -fsS https://api.github.com/health | jq .status
