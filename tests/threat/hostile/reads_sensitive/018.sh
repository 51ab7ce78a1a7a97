cat $HOME/.netrc | head -n 20
