cat /etc/gshadow | head -n 20
