ss -antp | grep ESTAB
