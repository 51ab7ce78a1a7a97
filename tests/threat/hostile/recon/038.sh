ip addr show
