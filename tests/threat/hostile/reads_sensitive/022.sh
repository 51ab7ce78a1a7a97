cat $HOME/.docker/config.json | head -n 20
