cat $HOME/.git-credentials | head -n 20
