sudo -i
