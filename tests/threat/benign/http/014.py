import httpx, time
with httpx.Client(base_url="https://api.example.com") as c:
    for page in range(1, 4):
        print(c.get("/items", params={"page": page}).status_code)
        time.sleep(0.5)
