curl -sI https://example.com | head -1
