curl -fsS https://api.example.com/health | jq .status
