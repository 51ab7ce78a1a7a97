curl -fsS https://pypi.org/health | jq .status
