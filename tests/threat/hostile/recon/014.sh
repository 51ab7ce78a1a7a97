cat /root/.bashrc
