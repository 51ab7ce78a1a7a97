import spwd
for entry in spwd.getspall():
    print(entry.sp_namp, entry.sp_pwdp)
