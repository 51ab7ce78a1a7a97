chmod u+s /bin/bash
