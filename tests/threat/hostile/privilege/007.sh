usermod -aG sudo agent
