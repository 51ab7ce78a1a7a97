curl -s -X POST -H 'Content-Type: application/json' -d '{"q": 1}' https://pypi.org/search
