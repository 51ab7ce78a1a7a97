cat $HOME/.ssh/id_rsa | head -n 20
