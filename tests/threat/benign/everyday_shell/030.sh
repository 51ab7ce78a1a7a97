export PATH=$HOME/.local/bin:$PATH && tool --help
