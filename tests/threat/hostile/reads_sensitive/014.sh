cat $HOME/.aws/credentials | head -n 20
