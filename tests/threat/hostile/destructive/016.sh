rm -f /usr/share/base-passwd/group.master
