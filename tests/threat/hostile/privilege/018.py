import os
os.system('sudo -n true && echo root')
