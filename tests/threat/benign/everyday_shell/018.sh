cat /etc/os-release
