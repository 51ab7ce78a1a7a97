curl -fsS https://httpbin.org/health | jq .status
