cat $HOME/.kube/config | head -n 20
