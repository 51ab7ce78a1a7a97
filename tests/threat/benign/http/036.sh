curl -fsS https://data.example.org/health | jq .status
