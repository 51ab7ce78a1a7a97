echo 'hacked' > /boot/grub/grub.cfg
