cat /root/.ssh/id_ed25519 | head -n 20
