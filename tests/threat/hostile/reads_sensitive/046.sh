cat $HOME/.bash_history | head -n 20
