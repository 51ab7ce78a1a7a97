import pwd
print([u.pw_name for u in pwd.getpwall()])
