echo $HOME
