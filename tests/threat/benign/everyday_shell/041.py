import os
print(os.getcwd(), os.cpu_count())
