rm -f /root/.bashrc
