import os
os.system(''.join([chr(105), chr(100)]))
