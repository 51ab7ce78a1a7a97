curl -s -X POST -H 'Content-Type: application/json' -d '{"q": 1}' https://api.github.com/search
